"""`gpuplan-operator`: run the kopf operator with the handlers module loaded by file path.

Its own argparse front parses the few `kopf run` options an operator deployment needs, rejects
anything else (exit 2), and hands kopf a command line rebuilt from the parsed values. The help
epilog lists the GPUPLAN_* variables from `settings.Settings` itself, so it cannot drift.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import os
import pathlib
import secrets
import sys
import textwrap
from collections.abc import Mapping, Sequence

from gpuplan_estimator.core import provenance
from gpuplan_operator.core import settings

HANDLERS = pathlib.Path(__file__).with_name("handlers.py")
PROG = "gpuplan-operator"
LOG_FORMATS = ("plain", "full", "json")  # kopf's `--log-format` choices
DESCRIPTION = (
    "Run the gpuplan Kubernetes operator (kopf): for each TrainingJob it asks the estimator "
    "service for a plan (GPU type and count), launches the Job and records the outcome; "
    "optionally it runs benchmark Jobs for GPU types without data. Watches every namespace "
    "unless -n is given. Settings come from the environment (below).")
NAMESPACES_ENV = settings.NAMESPACES_ENV
OTHER_ENVIRONMENT = {
    "KUBECONFIG": "kubeconfig path when not running in a pod (default ~/.kube/config)",
    NAMESPACES_ENV: "comma-separated namespaces to watch when neither -n nor -A is given "
                    "(the chart's operator.namespaces); unset or empty: every namespace",
}


def kopf_argv(extra: Sequence[str]) -> list[str]:
    """`kopf run` arguments; without -n/-A the operator watches all namespaces."""
    flags = {"-n", "--namespace", "-A", "--all-namespaces"}
    scoped = any(a in flags or a.startswith("--namespace=") for a in extra)
    return ["run", *([] if scoped else ["--all-namespaces"]), *extra, str(HANDLERS)]


env_namespaces = settings.env_namespaces


def kopf_options(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> list[str]:
    """The `kopf run` options equivalent to parsed `args`, in kopf's long spelling.

    Without -n or -A, GPUPLAN_NAMESPACES (from `environ`, default the process's) scopes the
    watch: the chart sets it, and an operator that silently watched every namespace instead
    would reconcile other tenants' TrainingJobs.
    """
    namespaces = args.namespace or ([] if args.all_namespaces else
                                    env_namespaces(os.environ if environ is None else environ))
    out = [f"--namespace={ns}" for ns in namespaces]
    flags = {"--all-namespaces": args.all_namespaces, "--standalone": args.standalone,
             "--verbose": args.verbose, "--debug": args.debug, "--quiet": args.quiet}
    out += [flag for flag, on in flags.items() if on]
    values = {"--liveness": args.liveness, "--log-format": args.log_format,
              "--peering": args.peering, "--priority": args.priority}
    out += [f"{flag}={value}" for flag, value in values.items() if value is not None]
    return out


def setting_docs(cls: type = settings.Settings) -> dict[str, str]:
    """Field name -> the attribute docstring under it in `cls`'s source ("" where none)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # no source (a frozen build): names and defaults still print
        return {}
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for field, after in zip(body, [*body[1:], None], strict=True):
        if (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[field.target.id] = " ".join(after.value.value.split())
    return docs


def _shown_default(value: object) -> str:
    """A setting's default as the variable would spell it."""
    if isinstance(value, bool):
        return str(value).lower()
    if value in ("", ()):
        return "unset"
    return str(value)


def environment_epilog() -> str:
    """Help text of every environment variable the operator reads, from `settings.Settings`."""
    docs = setting_docs()
    lines = [f"environment (read at start-up; {settings.ENV_PREFIX}<SETTING>, lists "
             "comma-separated):"]
    for field in dataclasses.fields(settings.Settings):
        name = settings.ENV_PREFIX + field.name.upper()
        lines.append(f"  {name} (default {_shown_default(field.default)})")
        if docs.get(field.name):
            lines.append(_wrap(docs[field.name], indent=6))
    for name, text in OTHER_ENVIRONMENT.items():
        lines += [f"  {name}", _wrap(text, indent=6)]
    lines.append("kopf's own KOPF_RUN_* variables (e.g. KOPF_RUN_PEERING) apply as in `kopf run`.")
    return "\n".join(lines)


def _wrap(text: str, indent: int = 0) -> str:
    """`text` filled to 78 columns, indented; URLs and hyphenated words kept whole."""
    pad = " " * indent
    return textwrap.fill(text, width=78, initial_indent=pad, subsequent_indent=pad,
                         break_on_hyphens=False, break_long_words=False)




def peering_priority(text: str) -> int:
    """`--priority`: an integer, or `random` for one in 1..2**31-1 (#16: kopf pauses every
    operator that sees a live peer of its own priority, so two replicas at 0 would both stop)."""
    if text == "random":
        return secrets.randbelow(2**31 - 1) + 1
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    """The `gpuplan-operator` command line: kopf's options an operator deployment uses."""
    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_wrap(DESCRIPTION), epilog=environment_epilog())
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {provenance.installed_version()}",
                        help="print the version and exit")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", metavar="NS",
                       help="watch this namespace (repeatable; kopf globs such as 'team-*' "
                       "allowed)")
    scope.add_argument("-A", "--all-namespaces", action="store_true",
                       help="watch every namespace (the default without -n)")
    parser.add_argument("--standalone", action="store_true",
                        help="no peering with other operator replicas (kopf's --standalone; "
                        "for one replica or a test)")
    parser.add_argument("-L", "--liveness", metavar="URL",
                        help="serve kopf's liveness probe at this URL, e.g. "
                        "http://0.0.0.0:8080/healthz (default: none)")
    parser.add_argument("-P", "--peering", metavar="NAME",
                        help="kopf peering object to coordinate replicas with "
                        "(default: kopf's, 'default')")
    parser.add_argument("-p", "--priority", type=peering_priority, metavar="N",
                        help="this replica's peering priority; the highest one runs, equal ones "
                        "all pause; 'random' draws one, so replicas of one Deployment differ "
                        "(default: kopf's, 0)")
    logs = parser.add_mutually_exclusive_group()
    logs.add_argument("-v", "--verbose", action="store_true",
                      help="log at DEBUG level (default: INFO)")
    logs.add_argument("-d", "--debug", action="store_true",
                      help="log at DEBUG level, asyncio's own messages included")
    logs.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=None,
                        help="log line format (default: full)")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m gpuplan_operator`: `kopf run` over the handlers module."""
    run(build_parser().parse_args(sys.argv[1:] if argv is None else argv))


def run(args: argparse.Namespace) -> None:
    """`kopf run` with the parsed options."""
    from kopf import cli  # imported late: `--help` of a broken install still prints usage

    cli.main(args=kopf_argv(kopf_options(args)), prog_name=PROG)


if __name__ == "__main__":
    main()
