from lmzfs.cli import main

raise SystemExit(main())
