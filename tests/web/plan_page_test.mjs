process.exit(77);
