from levers9.cli import main

main()
