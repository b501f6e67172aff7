"""`python -m experiments.complexity`."""
from experiments.complexity import main

raise SystemExit(main())
