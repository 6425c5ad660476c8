"""`python -m armllm` runs the command line."""
from armllm.cli import main

raise SystemExit(main())
