# `python -m riverlog` runs the command line (same as the `riverlog` console script).
from .cli import main

main()
