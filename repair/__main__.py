from repair.cli import main

main()
