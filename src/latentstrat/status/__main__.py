from latentstrat.status import main

main()
