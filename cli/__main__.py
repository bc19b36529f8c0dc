from kubegpu.cli import main

raise SystemExit(main())
