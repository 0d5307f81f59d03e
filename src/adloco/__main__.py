from adloco.cli import main

raise SystemExit(main())
