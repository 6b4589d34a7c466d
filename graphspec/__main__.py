"""`python -m graphspec ...`: the same as the `graphspec` console script."""

from graphspec.cli import main

raise SystemExit(main())
