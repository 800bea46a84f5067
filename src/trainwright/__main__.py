"""``python -m trainwright ...``: the ``trainwright`` command line."""

from trainwright.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
