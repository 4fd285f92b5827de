"""``python -m recap.bench``: run the benchmark's command line (`recap.bench.main`)."""

import sys

from recap.bench import main

sys.exit(main())
