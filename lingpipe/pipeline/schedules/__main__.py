"""`python -m lingpipe.pipeline.schedules`: a schedule's grid, bubble and peak alive (cli)."""

if __name__ == "__main__":
    from lingpipe.pipeline.schedules import cli

    raise SystemExit(cli.main())
