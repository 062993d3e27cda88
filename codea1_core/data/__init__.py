"""Problems and their golden tests: dataset loaders, source-text parsing, MBPP+ input restoration,
the prepared parquet files and the built-in CPU lab.
"""
