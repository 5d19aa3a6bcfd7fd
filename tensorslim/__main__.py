"""`python -m tensorslim` is the same as the `tensorslim` console script."""

from tensorslim.cli.main import main

raise SystemExit(main())
