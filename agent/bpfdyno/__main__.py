"""`python -m bpfdyno` runs the CLI."""

from bpfdyno.cli.main import main

raise SystemExit(main())
