import sys

from fedqueue.cli import main

sys.exit(main())
