from pipebubble.cli import main

main()
