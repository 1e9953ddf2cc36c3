from npubuild.cli import main

raise SystemExit(main())
