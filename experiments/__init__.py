"""One module per table of the chapter: `python -m experiments.<name>`."""
