from engramprof.cli import main

main()
