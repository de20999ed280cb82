"""``python -m dra_driver.testing.fake_apiserver``: run the fake apiserver standalone."""

import sys

from dra_driver.testing.fake_apiserver.server import main

sys.exit(main())
