from pipebubble.cli import entry

entry()
