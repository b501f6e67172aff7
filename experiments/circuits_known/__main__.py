"""`python -m experiments.circuits_known`."""
from experiments.circuits_known import main

raise SystemExit(main())
