"""``python -m modelyard`` runs the CLI."""
from modelyard.cli import main

if __name__ == "__main__":  # not when a spawned worker process re-imports this module
    raise SystemExit(main())
