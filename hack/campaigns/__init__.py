"""Campaign tools run by `make` (`chaos`, `bench-plans`, `abuse`, `bench-extender`, `corpus`,
`fuzz`): long runs that report tables, not tests. Run from the repository root with
``PYTHONPATH=tests:testbed:hack python -m campaigns.NAME``; the tests import small slices of
them (pytest's ``pythonpath`` includes hack/). They use the test helpers in
`tests/gpuplan_testing`, which never import them."""
