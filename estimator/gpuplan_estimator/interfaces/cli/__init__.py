"""The `gpuplan` command line, one module per group of subcommands."""
