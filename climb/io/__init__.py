"""Reading and writing: corpora in every supported format, local or at a URL
(`files`, `remote`), swarm CSVs (`swarm_csv`), mixture weight checks (`mixture`),
and the errors a user can fix (`errors.InputError`). Nothing here knows a stage.
"""
