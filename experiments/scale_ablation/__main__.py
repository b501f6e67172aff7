"""`python -m experiments.scale_ablation`."""
from experiments.scale_ablation import main

raise SystemExit(main())
