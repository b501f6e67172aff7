"""`python -m experiments.throughput`."""
from experiments.throughput import main

raise SystemExit(main())
