"""``python -m genq.worker`` is the ``genq`` command."""

from genq.worker.commands import main

# Guarded: processes started with multiprocessing's spawn (vLLM's engine core) import this
# module again, as __mp_main__, and must not run the command a second time.
if __name__ == "__main__":
    main()
