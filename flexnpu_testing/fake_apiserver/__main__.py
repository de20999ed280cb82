"""``python -m flexnpu_testing.fake_apiserver``: run the fake apiserver standalone."""

import sys

from flexnpu_testing.fake_apiserver.harness import main

sys.exit(main())
