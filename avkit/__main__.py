from avkit.cli import main

main()
