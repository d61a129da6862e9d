B
inorm.biasJ,<¢,<,¼ˆO,¼