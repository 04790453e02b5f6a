"""What tests share besides fixtures: the `fedqueue` command as they run it, helpers to start, drive and
check real services and workers, the processes a test started, a headless browser, test plugins.
"""
