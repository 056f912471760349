import sys

from latentstrat.status import main

sys.exit(main())
