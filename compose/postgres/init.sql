-- Each service owns its database; the services apply their own migrations.
create database orders;
create database inventory;
