"""The playbook language: a faithful small subset of Ansible's task semantics."""
