"""``python -m modelyard`` runs the CLI."""
from modelyard.cli import main

raise SystemExit(main())
