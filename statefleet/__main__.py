from statefleet.cli import main

main()
