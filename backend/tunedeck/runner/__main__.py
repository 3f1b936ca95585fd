from tunedeck.runner.main import cli

cli()
