"""`python -m bpfdyno` runs the CLI."""

from bpfdyno.cli import main

raise SystemExit(main())
