B
inorm.biasJÝ§,<+Ü,<£É,¼Ó,¼