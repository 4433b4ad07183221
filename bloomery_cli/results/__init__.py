"""Result records and what is made from them: ``bloomery results`` tables, READMEs and plots."""
