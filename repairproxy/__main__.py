"""``python -m repairproxy`` runs the CLI."""

from repairproxy.cli import main

if __name__ == "__main__":
    main()
