B
act.weightJ 9u>´øt>ß…>Jav>¬v>”@…>’Ju>-u>