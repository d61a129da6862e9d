Bbn2.running_varJ vÑô>û?ù>MÓí>–	?sHõ>¦
?¸÷>÷¢?