from matrixrl.cli import main

main()
