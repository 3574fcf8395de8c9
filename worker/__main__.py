"""``python -m genq.worker`` is the ``genq`` command."""

from genq.worker.commands import main

main()
