from fedqueue.cli.commands import main

main()
