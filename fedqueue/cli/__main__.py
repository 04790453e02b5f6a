from fedqueue.cli import main

main()
