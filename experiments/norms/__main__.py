"""`python -m experiments.norms`."""
from experiments.norms import main

raise SystemExit(main())
