"""`python -m experiments.winograd`."""
from experiments.winograd import main

raise SystemExit(main())
