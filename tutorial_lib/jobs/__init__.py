"""What the ranks of a ``parallel.launch.spawn`` group run in the chapters (the tests use them
too; the workers only the tests run are ``tests/spawn_workers.py``): the tensor-parallel checks
(``workers``), data-parallel and 2D training runs (``dp_workers``) and the nonuniform-TP job
(``ntp_workers``). They sit above ``train`` and ``parallel`` (they build and train models in
every layout), and are importable by name, as ``spawn`` needs."""
