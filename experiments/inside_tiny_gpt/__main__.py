"""`python -m experiments.inside_tiny_gpt`."""
from experiments.inside_tiny_gpt import main

raise SystemExit(main())
