"""``python -m recap.bench``: run the benchmark's command line (`recap.bench.cli.main`)."""

import sys

from recap.bench.cli import main

sys.exit(main())
