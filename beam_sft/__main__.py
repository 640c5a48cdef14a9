import sys

from beam_sft.cli import main

sys.exit(main())
