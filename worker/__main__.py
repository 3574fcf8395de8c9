"""``python -m genq.worker`` is the ``genq`` command."""

from genq.worker.cli import main

main()
